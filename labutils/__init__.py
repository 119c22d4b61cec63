"""labutils: the helper package of the Interconnect Lab.

One module per concept, in course order: measure, fit, model, predict, show (README, Layout). Notebooks narrate and call
these functions; the command line (`python -m labutils --help`) reaches the same code.
"""

__version__ = "0.1.0"

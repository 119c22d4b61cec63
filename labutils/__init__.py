"""labutils: the helper package of the Interconnect Lab, in layers that import only downward.

    core -> readers -> model -> measure -> experiments -> show -> doctor -> course -> cli

`core` checks inputs and speaks nccl-tests' units; `readers` turn what machines print into data;
`model` holds the pure formulas; `measure` runs ranks and times them; `experiments` are the course's
real runs; `show` draws; `doctor` explains a low busbw; `course` grades, runs and launches the
notebooks. README, Layout, draws the house. Notebooks narrate and call; `python -m labutils --help`
reaches the same code.
"""

__version__ = "0.1.0"

"""The course itself: which case this machine is in, the graders of the exercises, the headless runner,
the lab launcher, and the budget's command line."""

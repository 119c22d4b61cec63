"""The course itself: which case this machine is in, the graders of the exercises, the headless runner,
the lab launcher, the budget's worked cases and its command line."""

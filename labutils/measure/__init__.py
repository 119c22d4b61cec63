"""Measuring for real: starting ranks, pinning them, timing honestly, the all-reduce harness, the sweep,
copies over the wires, and the student's own measured link."""

"""What the student looks at: the figures (one shared look), the ring drawn step by step, and the
dashboards with sliders."""

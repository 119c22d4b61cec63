"""Why is my busbw low? The evidence (files or this machine), the cause rules, and the report."""

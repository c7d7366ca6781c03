"""Who runs next: fair share (fair.py) and its dispatcher (dispatcher.py), what a queued step
may take (limits.py), the sweeper, retention."""

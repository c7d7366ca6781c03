"""Who runs next: fair share (fair.py) and its dispatcher (dispatcher.py), the sweeper,
retention."""

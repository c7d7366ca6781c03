"""Who runs next: fair share and its dispatcher, the sweeper, retention."""

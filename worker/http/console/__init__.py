"""The operator and approver console in the browser, served by `turnstile api` under /console."""

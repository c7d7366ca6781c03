"""`python -m turnstile`: the same as the `turnstile` command."""

from turnstile.cli import main

main()

"""The operator library shared by the CLI and HTTP: flags, queues, listing, replay."""

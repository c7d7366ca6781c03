"""Everything that knows kombu's layout: the transport, dead letters."""

"""What goes upstream: drafts filled from results, and the outbox."""

"""The export service behind the gateway: accepts tasks, queues them, and runs them in workers."""

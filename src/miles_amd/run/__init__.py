"""Running the plan: the Ray head, the driver, the fail-fast watcher, the preflight."""

"""Sub-commands of the miles-amd CLI; each module exposes register(app)."""

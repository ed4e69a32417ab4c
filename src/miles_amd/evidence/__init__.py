"""Reading a run dir: strict readers of every source into one form, log sentinels."""

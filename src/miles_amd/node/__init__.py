"""Scripts run ON the node by file path, with the job's interpreter, not imported by the driver.

Each is self-contained (the standard library, and Ray for ``pullback_node``) so a node needs no
miles_amd install: ``miles_parse`` (miles' own ``parse_args()``, run by ``run.probes_miles``),
``bridge_census`` (the trainer's LoRA model on the meta device, run by ``run.probes_miles``'s deep
probe), ``pullback_node`` (a cluster job's evidence as frames, sent by ``run.pullback``).
"""

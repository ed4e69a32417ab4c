"""Scripts run ON the node by file path, with the job's interpreter; stdlib (and Ray) only."""

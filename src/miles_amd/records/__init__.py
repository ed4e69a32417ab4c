"""Typed records of a run dir's JSON files: what each holds and how it is validated.

- ``job``: ``job.json``, the Ray job's end state (:class:`~miles_amd.records.job.JobRecord`);
- ``env``: ``env.json``, the preflight's facts (:class:`~miles_amd.records.env.EnvRecord`);
- ``plan``: ``plan.json``, the launch plan (:class:`~miles_amd.records.plan.PlanRecord`);
- ``canary``: ``canary.json``, the all-reduce canary's result
  (:class:`~miles_amd.records.canary.CanaryRecord`);
- ``model``: how they are read (pydantic on their type hints, imported on first read) and
  their JSON Schemas generated.

Writers (the driver, the preflight, ``miles-amd canary``) and ``miles_amd.evidence`` (the
reader, into ``RunEvidence``) share them; judging, recording a baseline and the history
consume the records' fields, not the files (pyproject's import contracts). Pure: nothing
here opens a file.
"""

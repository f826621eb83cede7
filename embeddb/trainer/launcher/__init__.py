"""A training job from its YAML file (``embeddb train JOB.yaml``), from the command to the end.

Owns: :mod:`.job` (the job file's schema) with :mod:`.job_yaml` (line marks for its errors),
:mod:`.validate` and :mod:`.label_check` (the validation step before anything starts),
:mod:`.launch` (local shards + torchrun, restarts, clean stop), :mod:`.run` (an NN worker's
torchrun entry point) and :mod:`.rank` (its training loop, torch), :mod:`.loader` (the data
loader process of each rank), :mod:`.resume` (where a job with checkpoints stands),
:mod:`.failures` (how a rank reports and how a crash is told from an error).

The top of training (``trainer-layers`` contract): may import everything of
:mod:`embeddb.trainer`, :mod:`embeddb.features` and :mod:`embeddb.client`; nothing of the
trainer imports it.
"""

"""gpufleet's operator tooling: the `gpufleet` CLI, the replay, the doctor, the local stack and invoke.

Installed with `pip install` (the venv), never shipped in a Lambda layer: the functions import only the
runtime package `gpufleet`. Tooling may import the runtime; the runtime never imports tooling.
"""

"""Regression tests from the independent review of issue 32 (queued jobs and gangs): each reproduced a
problem on the first version and passes since its fix; the module docstrings say what went wrong."""

"""Scaling: which group an alarm means (`targets`), what to do about it (`core`, pure), how a change is
carried out safely (`execution`: lease, intent, apply, commit, audit) and the glue (`service`)."""

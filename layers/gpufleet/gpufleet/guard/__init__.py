"""The OOM guard and GPU health: policy, pure forecasts and health rules (`core`), what to tell
(`notes`), and the glue that reads metrics and replaces failed GPUs (`service`)."""

"""Notifications: the model producers build (`model`), routing policy, incidents folded and paced
(`incidents`, pure), rendered for people (`render`, pure), posted (`slack`) by the notifier (`service`)."""

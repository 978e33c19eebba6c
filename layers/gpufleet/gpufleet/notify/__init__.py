"""Notifications: incidents folded and paced (`incidents`, pure), rendered for people (`render`, pure),
posted (`slack`) by the notifier (`service`). What producers build is `domain.notification`; the routing
policy is `policy.notify`."""

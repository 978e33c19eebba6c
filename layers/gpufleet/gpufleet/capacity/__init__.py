"""Capacity: failed launches classified (`classify`), backoff and the on-demand fallback decided
(`core`), what to tell (`notes`), and the glue that reads activities and resizes groups (`service`)."""

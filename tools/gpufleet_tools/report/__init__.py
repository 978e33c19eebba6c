"""`gpufleet report`: who used the GPUs, from the nodes' usage records in CloudWatch Logs.

Each node writes one JSON record per usage window (format: gpufleet_node.schema, "Who used the GPUs").
`records` (parse and check one record), `bounds` (what a record may claim), `fleet` (which instances
existed, to vouch for node ids: --verify-nodes), `usage` (sum them per team, workload and group, price
them, find the money wasted), `prices` (the on-demand price table) and `render` (table, CSV, JSON,
Markdown) are pure. `identity` (the node publisher's workload model), `reader` (FilterLogEvents, in time
slices, with a progress bar) and `chart` (matplotlib) are the glue; cli/report.py asks EC2, Auto Scaling
and SageMaker for --verify-nodes.
"""

"""Replay: a workload trace (or a group's CloudWatch history) replayed minute by minute through the real
decision core and its baselines, so gpufleet's savings and its cost in waiting and killed jobs are measured.

`traces` (trace formats, the synthetic generator), `model` (pods, options, results), `nodes` (a simulated
instance), `simulate` (the cluster: nodes, scheduler, pending queue, disruptions), `core` (gpufleet's
controller: observations in, `scaling.core` decisions out, applied like the executor), `baselines` (oracle,
static peak, EC2 target tracking, Cluster Autoscaler), `policy` (the recommended policy), `report` (table,
goals), `history` (CloudWatch history replay) are pure; `service` is the glue (files, CloudWatch, matplotlib,
tqdm).
"""

"""The group seam: one adapter per group kind behind `provider.GroupProvider` (asg, nodegroup,
hyperpod), registered once in the composition root (`aws.fleet.GroupRegistry`)."""

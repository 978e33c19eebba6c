"""The shared vocabulary, the lowest floor: typed models, group kinds and their traits, node shapes,
notifications and incident records, errors, defaults. Pure: no AWS, no clock."""

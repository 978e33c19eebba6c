"""The shared vocabulary: typed models, the fleet policy, errors, defaults. Pure: no AWS, no clock."""

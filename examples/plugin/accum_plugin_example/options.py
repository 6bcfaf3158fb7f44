"""What the example plugin's entry points accept (entry point groups `accum.model_options` and
`accum.dataset_options`). Plain data, no torch: the API imports this to check a job's options
at submit; a key not declared here is refused before it reaches the plugin's function."""

MLP_OPTIONS = {"hidden": {"type": "integer", "minimum": 1, "maximum": 65536}}
BLOBS_OPTIONS = {
    "size": {"type": "integer", "minimum": 2, "maximum": 1_000_000},
    "classes": {"type": "integer", "minimum": 2, "maximum": 1000},
}

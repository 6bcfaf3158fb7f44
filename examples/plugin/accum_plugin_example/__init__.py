"""An example accum plugin: `example_mlp` (a model) and `example_blobs` (a dataset).

    pip install ./examples/plugin        # into the worker's environment
    {"model": "example_mlp", "dataset": "example_blobs", ...}
"""

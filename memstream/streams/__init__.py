"""The faust app and its stream processors: decode, call memory/, write through stores/, emit."""

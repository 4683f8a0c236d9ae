"""The operator tools: ``memstream rebuild``, replaying a file, the demo and ``memstream top``.

They sit above the runtime (a rebuild and the demo run a process); nothing of the product
imports them but ``memstream.cli``. The parts every process runs (its health listener and
metric samplers, the generation it serves) are beside the runtime, in ``memstream/``.
"""

"""DeepSpeed's Flops Profiler API, counting by trace: ``FlopsProfiler``, ``get_model_profile`` and the
config section."""

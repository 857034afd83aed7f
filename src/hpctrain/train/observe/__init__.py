"""What a run tells about itself: the log window's sums, the speed and memory fields of each `train`
record and their GPU readings, the profiler windows, and the sinks of those records (TensorBoard,
MLflow, W&B). Nothing here decides anything about training; it reads and writes out."""

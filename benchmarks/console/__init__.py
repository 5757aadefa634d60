"""The operator console under a simulated fleet: page render times in the browser and the CPU
the console adds to the control plane per ingested message (:mod:`benchmarks.console.bench`)."""

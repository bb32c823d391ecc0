"""Training machinery: the single fit loop, the multi-model group engine, batches, augmentation, optimizer
kernels, devices and seeding. Knows nothing of MDL, erasers or tasks."""

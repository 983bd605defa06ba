"""The exit statuses of ``gears-ddp`` besides 0 (done) and 75 (stopped by a signal with a
checkpoint, ``runtime.stopping.EXIT_INTERRUPTED``)."""

EXIT_FAILED = 1  # anything else: a replicate that failed, a non-finite loss, a sweep with no complete trial
EXIT_BAD_INPUT = 2  # a bad configuration, input or path; check: a problem stops the screen

"""How a run runs: in a fresh child process (launch → worker) with a timeout, its ending classified as data;
the training backends, the arms switched on (Liger patching, compile, SwitchBack), and test-only faults."""

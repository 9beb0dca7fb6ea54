"""Device and storage drivers for tests and development: real drivers that speak the real
protocols (plugin registration, DRA, and later CSI) to nodeagent, but whose devices are fake.
Not stages: they run as their own processes, as a vendor's driver would."""

"""gpufrag's tests; e2e/ holds the ones that run against a real control plane."""

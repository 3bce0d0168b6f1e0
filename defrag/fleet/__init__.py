"""The fleet at a glance: ``gpufrag inspect --summary`` and ``gpufrag inspect --plot FILE``."""

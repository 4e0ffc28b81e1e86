"""Load drivers (JMeter, Locust) and the blocker client; all report a `LoadResult`."""

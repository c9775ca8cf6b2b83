"""Geo routing: GeoIP, region catalog, latency model, routing policies, health (ARCHITECTURE.md, "route")."""

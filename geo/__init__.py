"""Geo routing: GeoIP, region catalog, latency model, routing policies, health (see DESIGN.md, step 3)."""

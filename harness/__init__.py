"""The harness: a topology brought up as real processes behind emulated links (topology, launcher,
supervise, leftovers, scrape targets, process helpers), the stand-in regions (standins/), the scenarios and
``nearshore chat`` (ARCHITECTURE.md, "harness")."""

"""VJP rule of If (both branches differentiated as subgraphs)."""

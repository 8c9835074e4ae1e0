"""The store: a plain git repository of snapshots, tags, patches and push records."""

"""Operations: each takes a store and/or transports, returns a result, never prints."""

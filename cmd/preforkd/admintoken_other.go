//go:build !unix

package main

import "fmt"

// readToken refuses every token file: who may read or write it (its mode
// and owner) cannot be checked on this system, and a token anybody may
// read guards nothing.
func readToken(path string) ([]byte, error) {
	return nil, fmt.Errorf("admin.token_file: %s: who may read it cannot be checked on this system", path)
}

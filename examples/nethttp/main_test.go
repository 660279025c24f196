package main

import (
	"testing"

	"github.com/idemkey/idemkey/examples/internal/accountsapp/apptest"
)

// TestAPI runs the shared API table (package apptest) against this server.
func TestAPI(t *testing.T) { apptest.Run(t, wire) }

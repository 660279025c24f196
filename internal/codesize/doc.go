// Package codesize holds a test only: it keeps every module of the workspace within
// the size limits of docs/architecture.md section 7: no library function over 80 lines,
// no library file over 600 lines.
package codesize

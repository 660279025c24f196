// Package sqltext reads the statements of an SQL text as Postgres would split
// them, past comments and quoted text: enough to find those that end a
// transaction (EndsTx).
package sqltext

import "strings"

// EndsTx reports whether sql holds a statement that would end the transaction:
// COMMIT, END, ABORT, ROLLBACK (not ROLLBACK TO a savepoint), PREPARE
// TRANSACTION. It reads the first words of each statement, past comments and
// quoted text; a function's body (dollar-quoted) cannot end the transaction of
// its caller (the server refuses). Quoted text is read both as standard strings
// and with backslash escapes, since the transaction may have turned
// standard_conforming_strings off: either reading that finds such a statement
// refuses the text.
func EndsTx(sql string) bool {
	return endsTx(sql, false) || endsTx(sql, true)
}

// endsTx is EndsTx with quoted strings read with backslash escapes (backslashes) or
// as standard strings.
func endsTx(sql string, backslashes bool) bool {
	var buf [3]string // a statement's first words: no allocation
	words := buf[:0]
	for i := 0; i <= len(sql); i++ {
		if i == len(sql) || sql[i] == ';' {
			if stmtEnds(words) {
				return true
			}
			words = buf[:0]
			continue
		}
		switch ch := sql[i]; {
		case ch == '-' && strings.HasPrefix(sql[i:], "--"):
			i += strings.IndexByte(sql[i:]+"\n", '\n')
		case ch == '/' && strings.HasPrefix(sql[i:], "/*"):
			i = skipComment(sql, i)
		case ch == '\'' || ch == '"':
			escapes := ch == '\'' && (backslashes || i > 0 && sql[i-1]|0x20 == 'e' && (i == 1 || !isWordByte(sql[i-2])))
			i = skipQuoted(sql, i, ch, escapes)
		case ch == '$' && (i == 0 || !inIdent(sql[i-1])): // a$b$ is one identifier, as the server reads it
			if j := strings.IndexByte(sql[i+1:], '$'); j >= 0 && isTag(sql[i+1:i+1+j]) {
				tag := sql[i : i+j+2]
				k := strings.Index(sql[i+len(tag):], tag)
				if k < 0 {
					return false
				}
				i += len(tag) + k + len(tag) - 1
			}
		case isWordByte(ch) && (i == 0 || !isWordByte(sql[i-1])) && len(words) < 3:
			j := i
			for j < len(sql) && isWordByte(sql[j]) {
				j++
			}
			words = append(words, sql[i:j])
			i = j - 1
		}
	}
	return false
}

// stmtEnds reports whether a statement starting with words ends the transaction.
func stmtEnds(words []string) bool {
	is := func(k int, w string) bool { return len(words) > k && strings.EqualFold(words[k], w) }
	switch {
	case is(0, "commit"), is(0, "end"), is(0, "abort"):
		return true
	case is(0, "rollback"): // ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name keeps it
		if is(1, "work") || is(1, "transaction") {
			return !is(2, "to")
		}
		return !is(1, "to")
	}
	return is(0, "prepare") && is(1, "transaction")
}

func isWordByte(ch byte) bool {
	return ch == '_' || ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9'
}

// inIdent reports whether ch continues an identifier (then a $ after it is part
// of the identifier, not a dollar quote).
func inIdent(ch byte) bool { return isWordByte(ch) || ch == '$' || ch >= 0x80 }

func isTag(s string) bool {
	for i := range len(s) {
		if !isWordByte(s[i]) || i == 0 && s[i] >= '0' && s[i] <= '9' {
			return false
		}
	}
	return true
}

func skipComment(sql string, i int) int {
	depth := 0
	for ; i < len(sql)-1; i++ {
		switch sql[i : i+2] {
		case "/*":
			depth++
			i++
		case "*/":
			if depth--; depth == 0 {
				return i + 1
			}
			i++
		}
	}
	return len(sql) - 1
}

// skipQuoted returns the index of the quote that closes the one at i (doubled
// quotes and, in an E” string, backslash escapes skipped).
func skipQuoted(sql string, i int, q byte, escapes bool) int {
	for i++; i < len(sql); i++ {
		if escapes && sql[i] == '\\' {
			i++
			continue
		}
		if sql[i] == q {
			if i+1 < len(sql) && sql[i+1] == q {
				i++
				continue
			}
			return i
		}
	}
	return len(sql) - 1
}

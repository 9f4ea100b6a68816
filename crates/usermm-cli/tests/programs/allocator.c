/* An allocator that gives memory back: glibc with a small trim threshold
 * shrinks its heap with brk, and a pool released with MADV_DONTNEED and
 * MADV_FREE, then reused. */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PAGE 4096UL

int main(void)
{
	size_t pool = 4UL << 20;
	char *p, *blocks[64];

	mallopt(M_TRIM_THRESHOLD, 64 * 1024);
	mallopt(M_MMAP_THRESHOLD, 1 << 20);
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 64; i++) {
			blocks[i] = malloc(16 * 1024);
			if (blocks[i])
				memset(blocks[i], i, 16 * 1024);
		}
		for (int i = 63; i >= 0; i--)
			free(blocks[i]);
	}
	p = mmap(NULL, pool, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 1;
	for (int round = 0; round < 3; round++) {
		for (size_t i = 0; i < pool; i += PAGE)
			p[i] = (char)round;
		madvise(p, pool / 2, MADV_DONTNEED);
		madvise(p + pool / 2, pool / 2, MADV_FREE);
	}
	munmap(p, pool);
	return 0;
}
